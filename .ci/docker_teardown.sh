#!/usr/bin/env bash
# Stop the private Docker engine started by .ci/docker_setup.sh. Containers are removed first; the data
# root and the cached base tarball are kept (pass --purge to delete the data root too).
set -uo pipefail

SOCK="${ARLCTL_DOCKER_SOCK:-/run/arlctl-docker.sock}"
DATA_ROOT="${ARLCTL_DOCKER_DATA:-/var/lib/arlctl-docker}"
PIDFILE="${ARLCTL_DOCKER_PIDFILE:-/run/arlctl-docker.pid}"
export DOCKER_HOST="unix://$SOCK"

if docker version >/dev/null 2>&1; then
  ids=$(docker ps -aq --filter label=arlctl.sandbox)
  [[ -n "$ids" ]] && docker rm -f $ids >/dev/null
fi
if [[ -s "$PIDFILE" ]]; then
  pid=$(cat "$PIDFILE")
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 40); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  kill -9 "$pid" 2>/dev/null
  echo "[docker_teardown] stopped dockerd ($pid)" >&2
else
  echo "[docker_teardown] no dockerd pidfile at $PIDFILE" >&2
fi
if [[ "${1:-}" == "--purge" ]]; then
  rm -rf "$DATA_ROOT"
  echo "[docker_teardown] removed $DATA_ROOT" >&2
fi
exit 0
