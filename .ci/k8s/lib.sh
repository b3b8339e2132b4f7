# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are for the scripts that source this file
# Shared settings and helpers of the .ci/k8s scripts (sourced, not run).
#
# Everything the node needs lives outside the clone, in the cache directory
#   ${WEIR_K8S_CACHE:-$HOME/.cache/weir-k8s}
# with this layout:
#   build-<KEY>/bin/        kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#                           kube-proxy (when built), pause: the build of .ci/k8s/build, kept
#                           across runs; KEY names the Debian source version and the recipe
#                           revision, so changing either rebuilds into a new directory
#   build-<KEY>/.complete   written last: a build without it is incomplete and is redone
#   kubectl-<VERSION>/      kubectl from the kubernetes-client .deb (dpkg-deb -x)
#   images/pause.tar        the pause image (see deploy/image/build-archive.py)
#   pki/, cfg/, cni/        certificates, kubeconfigs, containerd/kubelet/CNI configuration
#                           (written by .ci/k8s/setup; they name paths in this directory)
#   node/                   the running node's state (etcd data, containerd root, kubelet
#                           root, IPAM); .ci/k8s/down deletes it, so each `up` starts empty
#   run/                    pid files, containerd's socket, sysctls saved before `up`
#   logs/                   one log per component, kept after `down` for troubleshooting

K8S_CACHE=${WEIR_K8S_CACHE:-$HOME/.cache/weir-k8s}

# Debian bookworm's kubernetes source package (v1.20.2 despite the version string) and the
# matching kubectl package. Changing it rebuilds (the build directory is keyed by it).
K8S_SRC_VERSION=${WEIR_K8S_SRC_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
K8S_GIT_VERSION=v1.20.2
# Bump when the build recipe (flags, patches) changes: the cached binaries are rebuilt.
K8S_RECIPE_REV=1
K8S_BUILD_KEY="${K8S_SRC_VERSION}-r${K8S_RECIPE_REV}"
K8S_BUILD_DIR="$K8S_CACHE/build-$K8S_BUILD_KEY"
K8S_BIN="$K8S_BUILD_DIR/bin"
K8S_KUBECTL_DIR="$K8S_CACHE/kubectl-$K8S_SRC_VERSION"
KUBECTL="$K8S_KUBECTL_DIR/usr/bin/kubectl"
K8S_PKI="$K8S_CACHE/pki"
K8S_CFG="$K8S_CACHE/cfg"
K8S_NODE_STATE="$K8S_CACHE/node"
K8S_RUN="$K8S_CACHE/run"
K8S_LOGS="$K8S_CACHE/logs"
K8S_IMAGES="$K8S_CACHE/images"
ADMIN_KUBECONFIG="$K8S_CFG/admin.kubeconfig"
CONTAINERD_SOCK="$K8S_RUN/containerd.sock"

# The node: one bridge whose address is the node IP (the kubelet refuses a loopback node IP),
# the apiserver's address and the pods' gateway.
K8S_NODE_NAME=node1
K8S_BRIDGE=k8sbr0
K8S_NODE_IP=10.244.0.1
K8S_POD_SUBNET=10.244.0.0/24
K8S_SERVICE_RANGE=10.0.0.0/24
K8S_API_PORT=6443
# etcd on ports of its own: the high-availability tests run their own etcd on 2379/2380.
K8S_ETCD_CLIENT_PORT=12379
K8S_ETCD_PEER_PORT=12380

# One test node per machine: the bridge, the node IP's ports and the pods' network namespaces
# belong to the machine, not to a cache directory. K8S_MACHINE_DIR holds the lock every `up`
# and `down` takes, and `owner`: the cache directory of the node `up` started, so that an
# `up` or `down` of another cache never stops or cleans up a node that is not its own.
K8S_MACHINE_DIR=/run/weir-k8s
K8S_OWNER_FILE="$K8S_MACHINE_DIR/owner"

# The pause image (sandbox image): built from the source tree, never pulled.
K8S_PAUSE_IMAGE=k8s.local/pause:3.4.1

# The components that must be built; kube-proxy is built only with WEIR_K8S_WITH_PROXY=1.
K8S_REQUIRED_BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubelet pause"

# The sysctls the kubelet sets at start (it wants vm.overcommit_memory=1, kernel.panic=10,
# kernel.panic_on_oops=1); `up` saves them and `down` puts them back: the machine is shared.
K8S_SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops"

# /usr/sbin and /sbin hold ip, sysctl, mountpoint: a non-login root shell may lack them.
PATH="$PATH:/usr/sbin:/sbin"

export k8s_t0=${k8s_t0:-$(date +%s%N)}

# Seconds since the script started, for timings.
k8s_elapsed() {
  local now
  now=$(date +%s%N)
  printf '%d.%02d' $(((now - k8s_t0) / 1000000000)) $((((now - k8s_t0) / 10000000) % 100))
}

# A progress line with the elapsed time, on stderr.
k8s_log() {
  printf '[%7ss] %s\n' "$(k8s_elapsed)" "$*" >&2
}

k8s_die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

k8s_require_root() {
  [ "$(id -u)" = 0 ] || k8s_die "$(basename "$0") needs root (bridges, mounts, containers)"
}

# True when every required binary of the current build key is present.
k8s_built() {
  local b
  [ -f "$K8S_BUILD_DIR/.complete" ] || return 1
  for b in $K8S_REQUIRED_BINARIES; do
    [ -x "$K8S_BIN/$b" ] || return 1
  done
}

# True when everything `up` needs is in the cache (binaries, kubectl, PKI, configuration).
k8s_set_up() {
  k8s_built && [ -x "$KUBECTL" ] && [ -f "$K8S_PKI/ca.crt" ] && [ -f "$ADMIN_KUBECONFIG" ] &&
    [ -f "$K8S_CFG/containerd.toml" ] && [ -f "$K8S_IMAGES/pause.tar" ]
}

# kubectl with the admin kubeconfig, its discovery cache in the cache directory (its default
# is ~/.kube/cache).
KUBECTL_CACHE="$K8S_CACHE/kubectl-cache"
k8s_kubectl() {
  "$KUBECTL" --kubeconfig="$ADMIN_KUBECONFIG" --cache-dir="$KUBECTL_CACHE" "$@"
}

k8s_ctr() {
  ctr -a "$CONTAINERD_SOCK" -n k8s.io "$@"
}

# True when process $1 exists and is no zombie. (The components are reparented to PID 1
# once `up` exits; where PID 1 reaps late, an ended one lingers as a zombie that kill -0 sees.)
k8s_alive() {
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# The pid in run/NAME.pid if that process is alive, else nothing (and status 1).
k8s_pid() {
  local f="$K8S_RUN/$1.pid" pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && k8s_alive "$pid" || return 1
  printf '%s\n' "$pid"
}

# The node's long-running processes (kube-proxy, optional, aside).
K8S_COMPONENTS="etcd kube-apiserver kube-controller-manager kube-scheduler kubelet containerd"

# True when every component runs, the apiserver is ready and the node is Ready.
k8s_healthy() {
  local c
  for c in $K8S_COMPONENTS; do k8s_pid "$c" >/dev/null || return 1; done
  k8s_kubectl get --raw /readyz >/dev/null 2>&1 &&
    k8s_kubectl wait --for=condition=Ready "node/$K8S_NODE_NAME" --timeout=1s >/dev/null 2>&1
}

# Takes the machine-wide lock of `up` and `down` (once per process tree: a `down` that `up`
# runs inherits it).
k8s_lock() {
  if [ "${WEIR_K8S_LOCK_HELD:-0}" = 1 ]; then return 0; fi
  mkdir -p "$K8S_MACHINE_DIR"
  exec 9>"$K8S_MACHINE_DIR/lock"
  flock -w 600 9 || k8s_die "another .ci/k8s/up or down holds $K8S_MACHINE_DIR/lock"
  export WEIR_K8S_LOCK_HELD=1
}

# The cache directory of the node `up` started on this machine, or nothing.
k8s_owner() {
  cat "$K8S_OWNER_FILE" 2>/dev/null || true
}

# True when this cache's node has a process running or state left (what `down` removes).
k8s_has_state() {
  local c
  for c in $K8S_COMPONENTS kube-proxy; do
    if k8s_pid "$c" >/dev/null; then return 0; fi
  done
  [ -f "$K8S_RUN/sysctl-before" ] || [ -d "$K8S_NODE_STATE" ]
}

# What on this machine holds the node's bridge or ports, one per line (nothing: all free).
k8s_machine_in_use() {
  local port
  if ip link show "$K8S_BRIDGE" >/dev/null 2>&1; then echo "the bridge $K8S_BRIDGE exists"; fi
  for port in "$K8S_NODE_IP:$K8S_API_PORT" "127.0.0.1:$K8S_ETCD_CLIENT_PORT" "127.0.0.1:$K8S_ETCD_PEER_PORT" \
    "$K8S_NODE_IP:10250" "127.0.0.1:10257" "127.0.0.1:10259"; do
    if ss -Hltn "( sport = :${port##*:} )" 2>/dev/null | awk '{print $4}' | grep -qE "^(${port%:*}|0\.0\.0\.0|\*|\[::\]):${port##*:}$"; then
      echo "something listens on $port"
    fi
  done
}

# Waits up to $1 seconds (tenths allowed: 0.2 steps) for the command in the remaining
# arguments to succeed; fails naming what it waited for.
k8s_wait() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$(($(date +%s) + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      printf 'error: timed out after %ss waiting for %s\n' "$timeout" "$what" >&2
      return 1
    fi
    sleep 0.2
  done
}
