# shellcheck shell=bash
# Shared by the GPU timing scripts (scripts/gpu-*.sh), which source it; not run alone.
# ms CMD...: runs CMD with its output discarded and prints its wall time in whole ms.
# median: the median of the numbers on standard input (space- or line-separated; an
#   even count gives the mean of the middle two; nothing for no input).
# smi_pair: what nvidia-smi users run to see the topology and P2P matrix, the gate's yardstick.
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo $(((e - s) / 1000000)); }
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
smi_pair() { nvidia-smi topo -m && nvidia-smi topo -p2p rw; }
