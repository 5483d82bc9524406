#!/bin/sh
# The worker images' entrypoint: the upwell agent.
#   no arguments, or options only (--pool gpu)  -> python -m workers.agent <options>
#   a full command (a Batch start task's "/bin/sh -c ...", docker run IMAGE python -m ...)  -> run it as given
# so that Batch, VM Scale Sets and Container Instances can each pass their command line unchanged.
set -e
case "${1:-}" in
  ""|-*) exec python -m workers.agent "$@" ;;
  *) exec "$@" ;;
esac
