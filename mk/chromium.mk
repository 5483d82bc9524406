# Debian's Chromium and chromedriver for the dashboard's browser tests (tests/e2e/test_dashboard.py).
#   make chromium   installs them with apt-get when missing and run as root on Debian; otherwise it
#                   fails and says how to install them. A stamp keeps warm runs quiet.

CHROMIUM_STAMP := $(VENV)/.chromium

.PHONY: chromium

chromium: $(CHROMIUM_STAMP)

$(CHROMIUM_STAMP):
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
	  echo "chromium: $$(chromium --version 2>/dev/null | head -1)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else \
	  echo "The dashboard tests need Chromium and chromedriver. Install them, then rerun:" >&2; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y chromium chromium-driver" >&2; \
	  echo "  elsewhere: a Chromium and the matching chromedriver on PATH" >&2; \
	  exit 1; \
	fi
	@mkdir -p $(VENV) && touch $@

test: chromium
