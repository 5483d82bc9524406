# Slurm for the slurm pool's tests (included by the main Makefile).
#   make slurm   Debian's slurm-wlm and slurmrestd (the daemons, the REST API and the clients), installed with
#                apt-get when this runs as root on Debian/Ubuntu; elsewhere it says how to install
#                it, and the Slurm tests fail with the same message (they never skip).
# A stamp-file target: once Slurm is found or installed, warm runs do nothing.

SLURM_STAMP := .upwell/.slurm-installed

.PHONY: slurm
slurm: $(SLURM_STAMP)
test: slurm

$(SLURM_STAMP):
	@if PATH="$$PATH:/usr/sbin:/usr/local/sbin" command -v slurmctld >/dev/null 2>&1 \
	    && PATH="$$PATH:/usr/sbin:/usr/local/sbin" command -v slurmrestd >/dev/null 2>&1 \
	    && command -v sbatch >/dev/null 2>&1; then \
	  echo "slurm: found $$(PATH="$$PATH:/usr/sbin" command -v slurmctld)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends slurm-wlm slurmrestd \
	    || { apt-get update && apt-get install -y --no-install-recommends slurm-wlm slurmrestd; } || exit 1; \
	else \
	  echo "slurm: slurm-wlm is not installed and cannot be installed here (needs root and apt-get)."; \
	  echo "slurm: install it with 'sudo apt-get install slurm-wlm slurmrestd' (Debian/Ubuntu) or your site's"; \
	  echo "slurm: Slurm 22.05+; until then the tests in tests/e2e/test_slurm_pool.py fail and say so."; \
	  exit 0; \
	fi; \
	mkdir -p $(dir $@) && touch $@
