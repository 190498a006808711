#!/usr/bin/env python3
"""Every relative markdown link in README.md, docs/, bench/, eval/ and configs/ names a file or
directory that exists (anchors are not checked). Prints the broken ones; exit status 1 if any."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRS = ["docs", "bench", "eval", "configs"]
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
CODE = re.compile(r"`[^`]*`")


def links(path):
    fenced = False
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in LINK.finditer(CODE.sub("", line)):
            yield n, m.group(1) or m.group(2)


def main():
    files = [ROOT / "README.md"] + [p for d in DIRS if (ROOT / d).is_dir() for p in sorted((ROOT / d).rglob("*.md"))]
    bad = 0
    for f in files:
        if "raw" in f.relative_to(ROOT).parts:
            continue
        for n, target in links(f):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue  # a URL or an anchor in the same file
            dest = (f.parent / target.split("#", 1)[0]).resolve()
            if not dest.exists():
                print(f"{f.relative_to(ROOT)}:{n}: {target}")
                bad += 1
    print(f"{len(files)} files, {bad} broken links" if bad else f"{len(files)} files, links ok", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
