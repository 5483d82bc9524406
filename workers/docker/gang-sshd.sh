#!/bin/sh
# The coordination command of a Batch multi-instance task (upwell.pools.build_batch_tasks): on every node
# of a gang, start the image's sshd for the MPI's ssh launcher, and return once it accepts connections
# ("a typical coordination command line launches a background service and verifies that the service is
# ready", Use multi-instance tasks to run MPI applications in Batch). Batch runs the application command
# (the agent, on the primary) only after this has returned on every node.
#
# sshd runs as the image's user (the task's uid, 10001), on port 2222 of the host network: the node's own
# sshd has port 22, and a non-root sshd cannot bind a port below 1024. The host key is made here, on the
# node, for this task only; the user key that the MPI launcher logs in with was made at build
# (workers/docker/Dockerfile.mpi). Neither is in the repository.
set -eu
PORT="${UPWELL_SSHD_PORT:-2222}"
DIR="${TMPDIR:-/tmp}/upwell-sshd"
mkdir -p "$DIR" && chmod 700 "$DIR"
[ -f "$DIR/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "upwell gang host" -f "$DIR/host_ed25519"
/usr/sbin/sshd -f /app/workers/docker/gang_sshd_config -h "$DIR/host_ed25519" \
    -o "Port=$PORT" -o "PidFile=$DIR/sshd.pid" -E "$DIR/sshd.log"
i=0
until python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1).close()" "$PORT" \
        2>/dev/null; do
  i=$((i + 1))
  if [ "$i" -ge 60 ]; then
    echo "sshd did not accept connections on port $PORT within 30 s" >&2
    cat "$DIR/sshd.log" >&2 || true
    exit 1
  fi
  sleep 0.5
done
echo "sshd ready on port $PORT"
