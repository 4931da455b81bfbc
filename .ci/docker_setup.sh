#!/usr/bin/env bash
# Start a private Docker engine for the docker sandbox tests and build the sandbox base image.
#
# Idempotent: a running engine and an existing image are reused; the mmdebstrap rootfs tarball is cached
# under $ARLCTL_DOCKER_CACHE so a re-run after teardown only re-imports it. On success the last line on
# stdout is `export DOCKER_HOST=unix://...` (so `eval "$(.ci/docker_setup.sh | tail -1)"` works).
#
# The engine runs on its own socket with no bridge and no iptables: sandboxes use network_mode=none, and
# this never touches a host docker daemon or the host firewall.
set -euo pipefail

SOCK="${ARLCTL_DOCKER_SOCK:-/run/arlctl-docker.sock}"
DATA_ROOT="${ARLCTL_DOCKER_DATA:-/var/lib/arlctl-docker}"
EXEC_ROOT="${ARLCTL_DOCKER_EXEC:-/run/arlctl-docker-exec}"
PIDFILE="${ARLCTL_DOCKER_PIDFILE:-/run/arlctl-docker.pid}"
LOG="${ARLCTL_DOCKER_LOG:-/tmp/arlctl-dockerd.log}"
CACHE="${ARLCTL_DOCKER_CACHE:-/var/cache/arlctl}"
IMAGE="${ARLCTL_SANDBOX_IMAGE:-arlctl/sandbox-base:1}"
SUITE="${ARLCTL_DEBIAN_SUITE:-bookworm}"
MIRROR="${ARLCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TARBALL="$CACHE/sandbox-base-$SUITE.tar"
# Where overlay2 cannot stack (some nested containers), set ARLCTL_DOCKER_STORAGE_DRIVER=vfs.
STORAGE_OPT=()
[[ -n "${ARLCTL_DOCKER_STORAGE_DRIVER:-}" ]] && STORAGE_OPT=(--storage-driver "$ARLCTL_DOCKER_STORAGE_DRIVER")
export DOCKER_HOST="unix://$SOCK"

log() { echo "[docker_setup] $*" >&2; }

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v mmdebstrap >/dev/null || need_pkgs+=(mmdebstrap)
if ((${#need_pkgs[@]})); then
  log "installing ${need_pkgs[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_pkgs[@]}" >&2
fi

engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if engine_up; then
  log "engine already running at $DOCKER_HOST"
else
  mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
  log "starting dockerd on $SOCK (log: $LOG)"
  # setsid + nohup: the engine must outlive this script, not the test process group.
  setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false \
    -H "unix://$SOCK" --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" "${STORAGE_OPT[@]}" \
    >"$LOG" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    engine_up && break
    sleep 0.5
  done
  if ! engine_up; then
    log "dockerd did not come up; last log lines:"
    tail -20 "$LOG" >&2
    exit 1
  fi
fi

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE present"
else
  mkdir -p "$CACHE"
  if [[ ! -s "$TARBALL" ]]; then
    log "building Debian $SUITE rootfs with mmdebstrap (python3, python3-pytest, git) -> $TARBALL"
    # The sandbox user (uid 1000) owns /workspace; the image runs as that user, never root.
    mmdebstrap --variant=minbase --format=tar --include=python3,python3-pytest,git,ca-certificates \
      --customize-hook='chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/sh sandbox' \
      --customize-hook='mkdir -p "$1/workspace" && chroot "$1" chown sandbox:sandbox /workspace' \
      --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
      "$SUITE" "$TARBALL.tmp" "$MIRROR" >&2
    mv "$TARBALL.tmp" "$TARBALL"
  fi
  log "importing $TARBALL as $IMAGE"
  docker import \
    --change 'USER sandbox' --change 'WORKDIR /workspace' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/home/sandbox' \
    --change 'CMD ["sleep", "infinity"]' \
    "$TARBALL" "$IMAGE" >&2
fi

echo "export DOCKER_HOST=$DOCKER_HOST"
