.PHONY: demo test test-all docs
demo:
	./dev.sh demo
test:
	./dev.sh test
test-all:
	./dev.sh test-all
docs:
	./dev.sh docs
