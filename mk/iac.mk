# IaC checks for bicep/ (included by the main Makefile).
#   make iac-install   the IaC venv (.venv-iac) from the pinned bicep/requirements-iac.txt
#   make iac-check     every .bicep parses with pycep; checkov (with bicep/checks) passes;
#                      every resource matches the Azure type data (bicep/tools/bicep_types.py)
# Both are stamp-file targets: warm runs do nothing unless an input changed.
# checkov pins many packages tightly, so it lives in its own venv, not in .venv.

IAC_PY_BASE ?= $(or $(PY),python3)
IAC_VENV    := .venv-iac
IAC_BIN     := $(IAC_VENV)/bin
IAC_REQ     := bicep/requirements-iac.txt
IAC_INSTALLED := $(IAC_VENV)/.installed
IAC_CHECKED   := $(IAC_VENV)/.checked
IAC_INPUTS  := $(sort $(wildcard bicep/*.bicep bicep/*/*.bicep bicep/*.json bicep/modules/*.yaml \
                 bicep/checks/*.py bicep/tools/*.py tests/data/bicep_types/*.md) bicep/.checkov.yaml)

.PHONY: iac-install iac-check

iac-install: $(IAC_INSTALLED)

$(IAC_INSTALLED): $(IAC_REQ)
	test -x $(IAC_BIN)/python || $(IAC_PY_BASE) -m venv $(IAC_VENV)
	$(IAC_BIN)/python -m pip install --quiet --disable-pip-version-check -r $(IAC_REQ)
	touch $@

iac-check: $(IAC_CHECKED)

$(IAC_CHECKED): $(IAC_INSTALLED) $(IAC_INPUTS)
	$(IAC_BIN)/python bicep/tools/bicep_json.py --check
	$(IAC_BIN)/checkov --config-file bicep/.checkov.yaml --quiet
	$(IAC_BIN)/python bicep/tools/bicep_types.py
	touch $@
