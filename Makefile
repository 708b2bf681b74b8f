.PHONY: demo test
demo:
	./dev.sh demo
test:
	./dev.sh test
