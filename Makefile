# TokenRouter: the two commands of the README.
#   make demo   set up, fetch + export the demo pair, serve it through Triton, stop
#   make test   set up, run the test suite (fails if no test ran: pytest exit code 5)
.PHONY: setup demo test

PYTHON_VENV := .venv/bin/python

setup:
	scripts/setup.sh

demo:
	scripts/demo.sh

test: setup
	$(PYTHON_VENV) -m pytest -q
