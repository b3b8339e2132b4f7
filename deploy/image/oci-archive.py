#!/usr/bin/env python3
"""Packs a root file system into a single-layer container image archive, without a
registry, a daemon or network access.

Usage: oci-archive.py NAME:TAG ROOTFS OUT.tar ENTRYPOINT_JSON [ENV_JSON]

  NAME:TAG         the image reference, e.g. weir.local/weir:dev
  ROOTFS           a directory whose content becomes the image's only layer
  OUT.tar          the archive to write (written to OUT.tar.tmp, then renamed)
  ENTRYPOINT_JSON  e.g. '["weir"]'
  ENV_JSON         e.g. '["PATH=/usr/local/bin:/bin"]' (default: that PATH)

The archive is both a `docker save` archive (manifest.json naming the config and the layer)
and an OCI image layout (oci-layout, index.json, blobs/sha256/...), sharing one copy of each
blob, as `docker save` does since Docker 25: `ctr images import`, `docker load` and
`podman load` all accept it.

It is deterministic: the same ROOTFS content (bytes, modes, symlinks) gives the same archive
byte for byte. Every entry has mtime 0, owner 0:0, no user or group names, and entries are in
sorted order; the config's dates are the epoch. Only regular files, directories and symlinks
are packed (a root file system for an image needs nothing else; device nodes come from the
runtime).
"""

import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile
import tempfile

CHUNK = 1 << 20


def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def write_layer(root: str, out) -> None:
    """Writes ROOT's content as a tar stream into the binary file OUT."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            # os.walk does not descend into symlinked directories: they are listed in dirs,
            # and packed as the symlinks they are.
            for name in sorted(dirs + files):
                path = os.path.join(directory, name)
                arcname = os.path.relpath(path, root)
                st = os.lstat(path)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    sys.exit(f"error: {path}: only files, directories and symlinks can be packed")
                info = normalized(tar.gettarinfo(path, arcname=arcname))
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}.get(
        machine, machine
    )


def main() -> None:
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    name, root, out = sys.argv[1], sys.argv[2], sys.argv[3]
    entrypoint = json.loads(sys.argv[4])
    env = json.loads(sys.argv[5]) if len(sys.argv) == 6 else ["PATH=/usr/local/bin:/usr/bin:/bin"]
    if not os.path.isdir(root):
        sys.exit(f"error: {root} is not a directory")
    if ":" not in name.rsplit("/", 1)[-1]:
        sys.exit(f"error: {name}: expected NAME:TAG")
    tag = name.rsplit(":", 1)[1]

    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".layer-", suffix=".tar") as layer:
        write_layer(root, layer)
        layer.flush()
        layer_size = os.path.getsize(layer.name)
        layer_digest = sha256_file(layer.name)

        config = canonical(
            {
                "architecture": architecture(),
                "os": "linux",
                "created": "1970-01-01T00:00:00Z",
                "config": {"Entrypoint": entrypoint, "Env": env, "WorkingDir": "/"},
                "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
                "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "deploy/image/oci-archive.py"}],
            }
        )
        config_digest = hashlib.sha256(config).hexdigest()
        manifest = canonical(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": f"sha256:{config_digest}",
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": f"sha256:{layer_digest}",
                        "size": layer_size,
                    }
                ],
            }
        )
        manifest_digest = hashlib.sha256(manifest).hexdigest()
        index = canonical(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": f"sha256:{manifest_digest}",
                        "size": len(manifest),
                        # containerd (`ctr images import`) names the image after the first,
                        # OCI tools after the second.
                        "annotations": {
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": tag,
                        },
                    }
                ],
            }
        )
        docker_manifest = canonical(
            [
                {
                    "Config": f"blobs/sha256/{config_digest}",
                    "RepoTags": [name],
                    "Layers": [f"blobs/sha256/{layer_digest}"],
                }
            ]
        )

        entries = {
            "blobs/": None,
            "blobs/sha256/": None,
            f"blobs/sha256/{config_digest}": config,
            f"blobs/sha256/{layer_digest}": layer.name,
            f"blobs/sha256/{manifest_digest}": manifest,
            "index.json": index,
            "manifest.json": docker_manifest,
            "oci-layout": canonical({"imageLayoutVersion": "1.0.0"}),
        }
        tmp = out + ".tmp"
        with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arcname in sorted(entries):
                content = entries[arcname]
                info = normalized(tarfile.TarInfo(arcname.rstrip("/")))
                if content is None:
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                elif isinstance(content, bytes):
                    info.mode = 0o644
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
                else:
                    info.mode = 0o644
                    info.size = layer_size
                    with open(content, "rb") as f:
                        tar.addfile(info, f)
        os.replace(tmp, out)
    print(f"{out}: {name}, one layer of {layer_size} bytes, manifest sha256:{manifest_digest}")


if __name__ == "__main__":
    main()
