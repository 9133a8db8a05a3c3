#!/usr/bin/env bash
# The narrowband bench (bench/narrowband_wer.py: five recordings spoken into
# real calls over Opus, PCMU and PCMA, their transcripts' word error rate)
# on a lossy network: the server and its caller run inside a network
# namespace of their own that drops UDP packets at random, both ways (RTP,
# ICE, DTLS and the data channel; HTTP signalling is spared). iptables'
# statistic match, not tc netem: netem is a kernel module many hosts (this
# project's CI VMs included) do not have. Needs root, iproute2, iptables.
#
# Another bench after "--", with "{rate}" in its arguments replaced by each
# rate (bench/call_wer.py: 80 or more utterances, enough words for a point
# of WER).
#
#   sudo bash bench/lossy_network.sh            # 0 %, 5 % and 10 % loss
#   sudo bash bench/lossy_network.sh 3 7        # other rates, in %
#   sudo bash bench/lossy_network.sh 0 5 10 -- bench/call_wer.py --items 80 \
#       --label {rate} --log /tmp/wer.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
namespace="voice-agent-loss-$$"
rates=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do rates+=("$1"); shift; done
[ ${#rates[@]} -gt 0 ] || rates=(0 5 10)
bench=(bench/narrowband_wer.py --verbose)
if [ "${1:-}" = "--" ]; then shift; bench=("$@"); fi

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
    ip netns exec "$namespace" nice -n 5 "$PYTHON" "${bench[@]//\{rate\}/$rate}"
    echo
done
