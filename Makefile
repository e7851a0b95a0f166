# TokenRouter: the two commands of the README.
#   make demo   set up, fetch + export the demo pair, serve it through Triton, stop
#   make test   set up, lint, run the test suite (fails if no test ran: pytest exit code 5)
#   make lint   ruff on the whole tree (configured in pyproject.toml)
.PHONY: setup demo test lint

PYTHON_VENV := .venv/bin/python

setup:
	scripts/setup.sh

demo:
	@scripts/demo.sh

lint: setup
	.venv/bin/ruff check .

test: lint
	$(PYTHON_VENV) -m pytest -q
