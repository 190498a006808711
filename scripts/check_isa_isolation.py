#!/usr/bin/env python3
"""ISA isolation: no shared (weak) function in a linked binary carries AVX/AVX-512 code.

fathom compiles *_avx2.cpp, *_avx512.cpp and *_amx.cpp with their ISA's flags and picks kernels at
run time (CMakeLists.txt). An inline or template function that such a file instantiates from a
shared header (std::vector's growth, a helper in a common header) is emitted there with that ISA's
instructions *and* in the generic files without them; the linker keeps one of the copies (COMDAT, a
weak symbol) for every caller. If it keeps the AVX-512 one, a generic caller on an AVX2-only CPU
dies of SIGILL, and nothing in the tests on an AVX-512 machine would notice. Functions with internal
linkage (anonymous namespaces, static) and strong symbols defined in the ISA files are fine: only
the code that chose that ISA reaches them. So an ISA file's helpers and templates, and the ISA
headers' (simd_avx2.h, simd_avx512.h), live in anonymous namespaces.

Usage: check_isa_isolation.py BINARY...   Exits 1 naming each leaked function. Run by ctest.
"""
import re
import subprocess
import sys

# A mnemonic with a VEX/EVEX form starts with "v" (vmovups, vpaddd, vzeroupper, ...); the baseline
# x86-64 that generic files are compiled for has none. AVX-512 shows as zmm registers or a mask.
AVX_MNEMONIC = re.compile(r"^v[a-z0-9]+$")
MASK_MNEMONIC = re.compile(r"^k(mov|and|andn|or|xor|xnor|not|test|ortest|shiftl|shiftr|unpck|add)[bwdq]?[a-z]*$")
AVX512_OPERAND = re.compile(r"%zmm|%k[1-7]\b|\{%k|%[xy]mm(1[6-9]|2[0-9]|3[01])\b")
FUNC_HEADER = re.compile(r"^([0-9a-f]+) <(.+)>:$")
INSN = re.compile(r"^\s+[0-9a-f]+:\s+(.*)$")
PREFIXES = {"rep", "repz", "repnz", "repe", "repne", "lock", "notrack", "bnd", "data16", "addr32"}


def weak_functions(binary):
    """Addresses of the weak (COMDAT) text symbols: the copies the linker chose among."""
    out = subprocess.run(["nm", "--defined-only", binary], check=True, capture_output=True,
                         text=True).stdout
    weak = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "W":
            weak.add(int(parts[0], 16))
    return weak


def avx_use(binary, weak):
    """{mangled name: 'AVX' or 'AVX-512'} for each weak function whose code uses that ISA."""
    proc = subprocess.Popen(["objdump", "-d", "--no-show-raw-insn", "-j", ".text", binary],
                            stdout=subprocess.PIPE, text=True)
    found = {}
    name = None
    for line in proc.stdout:
        header = FUNC_HEADER.match(line)
        if header:
            name = header.group(2) if int(header.group(1), 16) in weak else None
            continue
        if name is None:
            continue
        insn = INSN.match(line)
        if not insn:
            continue
        words = insn.group(1).split()
        while words and words[0] in PREFIXES:
            words = words[1:]
        if not words:
            continue
        if MASK_MNEMONIC.match(words[0]) or (AVX_MNEMONIC.match(words[0])
                                              and AVX512_OPERAND.search(insn.group(1))):
            level = "AVX-512"
        elif AVX_MNEMONIC.match(words[0]):
            level = "AVX"
        else:
            continue
        if found.get(name) != "AVX-512":
            found[name] = level
    if proc.wait() != 0:
        sys.exit(f"objdump failed on {binary}")
    return found


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                         text=True).stdout
    return out.splitlines()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    status = 0
    for binary in sys.argv[1:]:
        found = avx_use(binary, weak_functions(binary))
        mangled = sorted(found)
        leaks = [(found[m], d) for m, d in zip(mangled, demangle(mangled))]
        if leaks:
            status = 1
            print(f"isa isolation: {binary}: {len(leaks)} shared function(s) carry ISA-specific code;"
                  " a generic caller would run it on any CPU:")
            for level, name in leaks:
                print(f"  {level}: {name}")
        else:
            print(f"isa isolation: {binary}: ok (no weak function carries AVX code)")
    return status


if __name__ == "__main__":
    sys.exit(main())
