# One command to read the site, one to run every test. Both set everything up first.
#   make serve   -> venv + packages + KaTeX, run the proofs, serve the site at http://127.0.0.1:8000
#   make test    -> the same set-up + Chromium, run the proofs, then the model, drill, site and browser tests
#                   (their one strict build also prints the cheat sheet's PDF)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KATEX  := build/npm/node_modules/katex/package.json
JOBS   ?= 2
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup chromium proofs site serve test pdf bench seeds at-scale notebooks clean

setup: $(VENV)/.installed $(KATEX)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[site,browser]'
	@# pip compiles the packages' bytecode one file at a time; compileall uses every core. A file written for a newer
	@# Python (torch ships one) fails to compile here, as it does under pip, which ignores it: so does this line.
	@$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

$(KATEX):
	npm install --silent --no-audit --no-fund --prefix build/npm katex@0.16.47

chromium:                ## Debian's chromium for the browser tests and the PDF, with CJK fonts for Chinese text
	@{ command -v chromium >/dev/null && fc-list 2>/dev/null | grep -qi "noto.*cjk"; } || { \
	  echo "installing Debian's chromium and fonts-noto-cjk for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium fonts-noto-cjk >/dev/null; }

proofs: setup            ## run every proof; writes evidence/ that the site shows
	$(PY) -m pytest proofs -n $(JOBS) --dist loadfile -q --progress

site: proofs
	$(VENV)/bin/mkdocs build --strict

serve: setup             ## reruns only proofs whose evidence is missing, failed or stale; serves even if one fails
	-@stale="$$($(PY) -m proofs.stale)"; if [ -n "$$stale" ]; then \
	  $(PY) -m pytest $$stale -n $(JOBS) --dist loadfile -q --progress --reuse-evidence; fi
	$(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

test: setup chromium     ## what CI runs: proofs first (they write the evidence), then everything else
	$(PY) -m pytest proofs -n $(JOBS) --dist loadfile -q --progress --durations=10
	$(PY) -m pytest tests -n $(JOBS) -q --durations=10

pdf: setup chromium      ## the cheat sheet as build/pdf/cheat-sheet.pdf (linked from the page by the next build)
	$(PY) docs/hooks/print_pdf.py

bench: setup             ## the shared encoder layer vs torch.nn, and the proof suite's time per file in reference units
	$(PY) bench/bench_encoder_layer.py
	$(PY) bench/bench_suite.py --workers $(JOBS)

SEEDS ?= 20
seeds: setup             ## every proof under $(SEEDS) random seeds outside 0-29: each test's pass rate
	$(PY) -m proofs.seeds proofs -n $(SEEDS) --jobs $(JOBS)

PRESET ?=
at-scale: setup          ## the training verdicts on a ~100x larger model and real text: bench/at_scale/<preset>.json
	$(PY) -m proofs.at_scale $(if $(PRESET),--preset $(PRESET))   # gpu with CUDA (~8 min), else cpu (~30 min)

notebooks: setup         ## proofs as .ipynb under build/notebooks (never committed)
	mkdir -p build/notebooks
	for f in $$(find proofs -name 'proof_*.py'); do \
	  $(VENV)/bin/jupytext --quiet --to notebook -o build/notebooks/$$(basename $$f .py).ipynb $$f; done

clean:
	rm -rf site evidence build/notebooks build/site-extra build/pdf build/screenshots .pytest_cache
