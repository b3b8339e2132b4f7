#!/usr/bin/env bash
# Writes the weir container image as an archive, with no Docker, no registry and no network:
#
#   deploy/image/build-archive.sh [BINARY] [OUT.tar] [NAME:TAG]
#
#   BINARY    the weir binary (default: target/release/weir of this clone)
#   OUT.tar   where to write the archive (default: target/weir-image.tar)
#   NAME:TAG  the image reference (default: weir.local/weir:dev)
#
# The image has one layer:
#   /usr/local/bin/weir   BINARY, stripped unless WEIR_IMAGE_STRIP=0
#   /lib..., /lib64/...   the shared libraries `ldd BINARY` names (glibc, libgcc_s, libz, ...)
#   /bin/busybox + links  Debian's busybox-static: `sh` and tools for `kubectl exec`
#   /etc/passwd, /etc/group (root, nobody), /tmp (mode 1777)
# and the entrypoint ["weir"] (so a pod's `args` are weir's arguments).
#
# The archive is a `docker save` archive and an OCI image layout at once (see
# oci-archive.py): load it with `ctr -n k8s.io images import OUT.tar` (what .ci/k8s/import-image
# does for the test node), `docker load -i OUT.tar` or `podman load -i OUT.tar`. The same
# binary gives the same archive, byte for byte. For a Dockerfile build see ./Dockerfile.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
binary=${1:-$repo/target/release/weir}
out=${2:-$repo/target/weir-image.tar}
name=${3:-weir.local/weir:dev}

[ -x "$binary" ] || { echo "error: $binary is not an executable (build it: cargo build --release -p weir-cli)" >&2; exit 1; }
if ! /bin/busybox --list >/dev/null 2>&1; then
  echo "error: /bin/busybox is missing: apt-get install -y busybox-static" >&2
  exit 1
fi
if ! { ldd /bin/busybox 2>&1 || true; } | grep -q 'not a dynamic executable'; then
  echo "error: /bin/busybox is not static (the image has no libraries for it): apt-get install -y busybox-static" >&2
  exit 1
fi

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/weir-image.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs"/{bin,etc,tmp,usr/local/bin,proc,sys,dev}
chmod 0755 "$rootfs" "$rootfs"/{bin,etc,usr,usr/local,usr/local/bin,proc,sys,dev}
chmod 1777 "$rootfs/tmp"

cp "$binary" "$rootfs/usr/local/bin/weir"
chmod 0755 "$rootfs/usr/local/bin/weir"
if [ "${WEIR_IMAGE_STRIP:-1}" != 0 ]; then
  strip "$rootfs/usr/local/bin/weir"
fi

# The libraries the dynamic loader will look for, at the paths ldd resolved them to (the
# loader itself, /lib64/ld-linux-x86-64.so.2, included). glibc 2.34+ has NSS files/dns
# built in, so name resolution needs no dlopen'ed library beyond these.
ldd "$binary" | grep -o '/[^ ]*' | sort -u | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
  chmod 0755 "$rootfs$lib"
done

cp /bin/busybox "$rootfs/bin/busybox"
chmod 0755 "$rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
done

printf 'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
find "$rootfs/etc" -type f -exec chmod 0644 {} +

mkdir -p "$(dirname "$out")"
python3 "$here/oci-archive.py" "$name" "$rootfs" "$out" '["weir"]' \
  '["PATH=/usr/local/bin:/usr/bin:/bin"]'
