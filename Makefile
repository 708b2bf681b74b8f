.PHONY: demo test docs
demo:
	./dev.sh demo
test:
	./dev.sh test
docs:
	./dev.sh docs
