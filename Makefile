PYTHON ?= python3

.PHONY: install test test-fast lint format schemas bench demo examples

install:
	$(PYTHON) -m pip install -q -e ".[test,torch]"

test:
	$(PYTHON) -m pytest -q

# the edit loop: every test but those marked slow
test-fast:
	$(PYTHON) -m pytest -q -m "not slow"

lint:
	ruff check . && ruff format --check .

format:
	ruff check --fix . && ruff format .

schemas:
	$(PYTHON) -m remat_cli.schemas schemas

examples:
	remat generate unet --depth 3 -o graphs/unet_train.json
	remat generate transformer --layers 4 -o graphs/transformer_train.json

demo:
	remat solve graphs/torch_unet_train.onnx --budget 70% --solver fastsa --time-limit 30 -o schedule.json
	remat validate graphs/torch_unet_train.onnx schedule.json
	remat run graphs/torch_unet_train.onnx schedule.json

bench:
	$(PYTHON) bench/run_all.py
