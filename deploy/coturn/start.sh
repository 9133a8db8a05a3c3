#!/bin/sh
# Runs coturn with turnserver.conf (next to this script) plus the two things
# each deployment sets, written into a config file of its own (mode 600, in
# TURN_RUNTIME_DIR, default /tmp) so that neither appears on a command line:
#
#   the shared secret   TURN_SECRET_FILE (a file holding it), or else the
#                       TURN_SECRET environment variable;
#   allowed peers       TURN_ALLOWED_PEER_IP: the voice agent's own addresses
#                       (addresses or first-last ranges, separated by spaces
#                       or commas), the only private or loopback addresses
#                       coturn will relay to. Unset, every address of this
#                       host (hostname -I): right when coturn shares the
#                       voice agent's host network, as in deploy/compose.yaml.
#
# Its arguments go to turnserver: listening and relay addresses, ports, realm.
set -euf

here=$(dirname "$0")
runtime=${TURN_RUNTIME_DIR:-/tmp}

if [ -n "${TURN_SECRET_FILE:-}" ]; then
    secret=$(cat "$TURN_SECRET_FILE")
else
    secret=${TURN_SECRET:-}
fi
# coturn itself never needs it in its environment.
unset TURN_SECRET
# One line: anything after a line break would be read as more settings.
if [ -z "$secret" ] || [ "$(printf '%s' "$secret" | wc -l)" -ne 0 ]; then
    echo "start.sh: set TURN_SECRET_FILE or TURN_SECRET to the shared secret, on one line" >&2
    exit 2
fi

peers=${TURN_ALLOWED_PEER_IP:-$(hostname -I 2>/dev/null || true)}
peers=$(printf '%s' "$peers" | tr ',' ' ')
if [ -z "$(printf '%s' "$peers" | tr -d ' ')" ]; then
    echo "start.sh: no peer to allow: set TURN_ALLOWED_PEER_IP to the voice agent's address" >&2
    exit 2
fi

umask 077
config="$runtime/turnserver.conf"
{
    cat "$here/turnserver.conf"
    printf 'static-auth-secret=%s\n' "$secret"
    for peer in $peers; do
        printf 'allowed-peer-ip=%s\n' "$peer"
    done
} >"$config"
echo "start.sh: of the private and loopback peers, relaying only to: $peers"
exec turnserver -c "$config" "$@"
