#!/usr/bin/env python3
"""Copy a wheel with the debug sections of its shared objects removed.

    python3 bench/slim_wheel.py WHEEL OUTPUT_DIR

Why: the GPU machine has no network, so a Python package it lacks travels with the device
call, inside that call's 64 MiB. CTranslate2 4.8.5's wheel is 43 MB, and 44 MB of its
70 MB Python extension are DWARF debug sections that nothing loads; without them the wheel
is 25 MB and fits beside the build bundle's debs. Only `strip --strip-debug` runs on each
`.so` (code, symbols and the CUDA fat binaries are kept byte for byte), and the wheel's
RECORD gets the new sizes and sha256 digests, so pip installs the copy as it would the
original. Prints the sizes before and after.
"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


def record_digest(data: bytes) -> str:
    """RECORD's hash field (PEP 376/427): sha256, urlsafe base64 without padding."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def strip_debug(data: bytes, scratch: str) -> bytes:
    path = os.path.join(scratch, "object.so")
    with open(path, "wb") as handle:
        handle.write(data)
    subprocess.run(["strip", "--strip-debug", path], check=True)
    with open(path, "rb") as handle:
        return handle.read()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    source, output_dir = sys.argv[1], sys.argv[2]
    if shutil.which("strip") is None:
        print("slim_wheel: 'strip' (binutils) is not on PATH", file=sys.stderr)
        return 1
    os.makedirs(output_dir, exist_ok=True)
    target = os.path.join(output_dir, os.path.basename(source))
    if os.path.abspath(target) == os.path.abspath(source):
        print("slim_wheel: OUTPUT_DIR must not be the wheel's own folder", file=sys.stderr)
        return 2
    with zipfile.ZipFile(source) as wheel, tempfile.TemporaryDirectory() as scratch:
        members = wheel.infolist()
        contents = {}
        for member in members:
            data = wheel.read(member.filename)
            if member.filename.endswith(".so") or ".so." in os.path.basename(member.filename):
                data = strip_debug(data, scratch)
            contents[member.filename] = data
        record_names = [name for name in contents if name.endswith(".dist-info/RECORD")]
        if len(record_names) != 1:
            print(f"slim_wheel: {source} has {len(record_names)} RECORD files, expected 1",
                  file=sys.stderr)
            return 1
        record_name = record_names[0]
        lines = []
        for line in contents[record_name].decode("utf-8").splitlines():
            name = line.split(",", 1)[0]
            if name in contents and name != record_name:
                line = f"{name},{record_digest(contents[name])},{len(contents[name])}"
            lines.append(line)
        contents[record_name] = ("\n".join(lines) + "\n").encode("utf-8")
        partial = target + ".partial"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as slim:
            for member in members:
                info = zipfile.ZipInfo(member.filename, member.date_time)
                info.external_attr = member.external_attr
                info.compress_type = zipfile.ZIP_DEFLATED
                slim.writestr(info, contents[member.filename])
        os.replace(partial, target)
    before, after = os.path.getsize(source), os.path.getsize(target)
    print(f"slim_wheel: {target}: {after / 1e6:.1f} MB (was {before / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
