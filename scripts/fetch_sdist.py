#!/usr/bin/env python3
"""Fetches a PyPI source distribution, checks it against the sha256 PyPI's simple index publishes,
and unpacks it (or only the members matching --only globs) into OUT/src.

    fetch_sdist.py NAME VERSION OUT [--only GLOB ...]

Used by scripts/setup_xgrammar.sh (xgrammar's C++ core) and scripts/setup.sh (llama.cpp's
tokenizer test vocabularies from the llama-cpp-python sdist). Standard library only.
"""
import argparse
import fnmatch
import hashlib
import pathlib
import re
import shutil
import sys
import tarfile
import urllib.parse
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("version")
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--only", nargs="*", default=None, help="globs of member paths below the sdist's top directory")
    args = ap.parse_args()
    index = f"https://pypi.org/simple/{args.name}/"
    html = urllib.request.urlopen(index, timeout=60).read().decode()
    stem = f"{args.name.replace('-', '_')}-{args.version}"
    wanted = (f"{stem}.tar.gz", f"{args.name}-{args.version}.tar.gz")
    link = next((m for m in re.findall(r'href="([^"]+)"', html) if any(w in m for w in wanted)), None)
    if link is None:
        sys.exit(f"fetch_sdist: no sdist of {args.name} {args.version} on PyPI")
    url, _, digest = urllib.parse.urljoin(index, link.replace("&amp;", "&")).partition("#sha256=")
    data = urllib.request.urlopen(url, timeout=300).read()
    if not digest or hashlib.sha256(data).hexdigest() != digest:
        sys.exit(f"fetch_sdist: {args.name} {args.version}: sha256 mismatch")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "sdist.tar.gz"
    tmp.write_bytes(data)
    shutil.rmtree(args.out / "src", ignore_errors=True)
    staging = args.out / "unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(tmp) as t:
        members = t.getmembers()
        if args.only is not None:
            def keep(m):
                rel = m.name.split("/", 1)[1] if "/" in m.name else ""
                return any(fnmatch.fnmatch(rel, g) for g in args.only)
            members = [m for m in members if keep(m)]
        if hasattr(tarfile, "data_filter"):
            t.extractall(staging, members=members, filter="data")
        else:  # Python < 3.11.4 (Debian 12's own 3.11.2): no filters; plain files and dirs only
            for m in members:
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name.split("/"):
                    sys.exit(f"fetch_sdist: refusing tar member {m.name!r} ({m.type!r})")
                m.mode &= 0o755
            t.extractall(staging, members=members, numeric_owner=False)
    (top,) = list(staging.iterdir())  # the sdist's one top directory
    top.rename(args.out / "src")
    staging.rmdir()
    tmp.unlink()


if __name__ == "__main__":
    main()
