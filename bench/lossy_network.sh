#!/usr/bin/env bash
# The narrowband bench (bench/narrowband_wer.py: five recordings spoken into
# real calls over Opus, PCMU and PCMA, their transcripts' word error rate)
# on a lossy network: the server and its caller run inside a network
# namespace of their own that drops UDP packets at random, both ways (RTP,
# ICE, DTLS and the data channel; HTTP signalling is spared). iptables'
# statistic match, not tc netem: netem is a kernel module many hosts (this
# project's CI VMs included) do not have. Needs root, iproute2, iptables.
#
#   sudo bash bench/lossy_network.sh            # 0 %, 5 % and 10 % loss
#   sudo bash bench/lossy_network.sh 3 7        # other rates, in %
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
namespace="voice-agent-loss-$$"
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(0 5 10)

cleanup() { ip netns del "$namespace" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$namespace"
ip -n "$namespace" link set lo up
for rate in "${rates[@]}"; do
    ip netns exec "$namespace" iptables -F INPUT
    if [ "$rate" != 0 ]; then
        probability=$(awk -v r="$rate" 'BEGIN { printf "%.4f", r / 100 }')
        ip netns exec "$namespace" iptables -A INPUT -p udp \
            -m statistic --mode random --probability "$probability" -j DROP
    fi
    echo "### ${rate} % of UDP packets lost at random"
    ip netns exec "$namespace" nice -n 5 "$PYTHON" bench/narrowband_wer.py --verbose
    echo
done
