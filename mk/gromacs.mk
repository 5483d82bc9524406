# GROMACS for the bring-your-own-code tests and demo (included by the main Makefile).
#   make gromacs   gmx on PATH: Debian's gromacs package when run as root on Debian/Ubuntu,
#                  else a message on how to install it (the GROMACS tests then fail saying so).
GMX_STAMP := $(VENV)/.gromacs

.PHONY: gromacs

gromacs: $(GMX_STAMP)

$(GMX_STAMP):
	@mkdir -p $(VENV)
	@if command -v gmx >/dev/null 2>&1; then touch $@; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gromacs && touch $@; \
	else \
	  echo "GROMACS (gmx) is not installed: as root run 'apt-get install gromacs' (Debian/Ubuntu) or put a gmx on PATH; the GROMACS tests fail until then"; \
	fi
