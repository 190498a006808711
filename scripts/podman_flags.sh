#!/usr/bin/env bash
# Prints the options `podman run` and `podman build` need on this machine, on one line, after
# probing them with `podman run --rm --entrypoint true IMAGE`; exits 1 with every attempt's error on stderr
# when none works. Used by scripts/image.sh and tests/image/test_container_image.py.
#   scripts/podman_flags.sh IMAGE
# Tried in order, first success wins:
#   (none)                          - a machine where podman's defaults work
#   --ulimit nofile=H:H nproc=4096  - podman asks for RLIMIT_NOFILE 1048576 and NPROC 4194304 by
#                                     default; raising a hard limit needs CAP_SYS_RESOURCE, which
#                                     root lacks in some VMs ("setrlimit RLIMIT_NOFILE: Operation
#                                     not permitted"). H is our hard limit; 4096 processes per uid
#                                     is far above the server's thread count.
#   --runtime runc (+ the ulimits)  - crun refuses cgroup v1 hosts whose cgroup2 hierarchy holds a
#                                     controller ("cgroups in hybrid mode not supported"); runc runs.
set -uo pipefail
image=${1:?usage: podman_flags.sh IMAGE}
command -v podman >/dev/null || { echo "podman not installed" >&2; exit 1; }
limits="--ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=4096:4096"
runc=""
command -v runc >/dev/null && runc="--runtime runc"
errors=""
for flags in "" "$limits" ${runc:+"$runc"} ${runc:+"$runc $limits"}; do
  # shellcheck disable=SC2086  # flags is a list of words
  if out=$(podman run --rm $flags --entrypoint true "$image" 2>&1); then
    echo "$flags"
    exit 0
  fi
  errors+="podman run ${flags:-(no options)}: $(echo "$out" | tail -1)"$'\n'
done
printf '%s' "$errors" >&2
exit 1
