#!/bin/sh
# Written by tests/slurm_cluster.py: node-local GPU places -> this node's devices (see there).
[ -n "$CUDA_VISIBLE_DEVICES" ] || exit 0
case "$SLURMD_NODENAME" in
  n1) set -- 0 1 ;;
  n2) set -- 2 3 ;;
  *) exit 0 ;;
esac
out=""
for place in $(echo "$CUDA_VISIBLE_DEVICES" | tr , " "); do
  eval "dev=\${$((place + 1))}"
  out="${out:+$out,}$dev"
done
echo "export CUDA_DEVICE_ORDER=PCI_BUS_ID"
echo "export CUDA_VISIBLE_DEVICES=$out"
