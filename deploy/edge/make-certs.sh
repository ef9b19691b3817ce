#!/usr/bin/env bash
# Certificates and passwords for the edge box (compose.yaml, or poirotd.service), from a CA of
# the box's own: `deploy/edge/make-certs.sh [OUT]` (OUT defaults to deploy/edge/secrets, which
# compose.yaml mounts and git ignores). Needs openssl and mosquitto_passwd (Debian package
# mosquitto; without it the eclipse-mosquitto image is run with docker).
#
#   OUT/ca/                  ca.crt, ca.key    the CA; made once, kept (every file below trusts it)
#   OUT/poirotd/tls/         tls.crt, tls.key, ca.crt   poirotd's gRPC and metrics ports, and its
#                            client certificate to the broker (and to its own health probe)
#   OUT/poirotd/mqtt-password                   poirotd's MQTT password (user poirotd)
#   OUT/mosquitto/           tls.crt, tls.key, ca.crt, passwords   the broker's TLS listener
#   OUT/mas/                 tls.crt, tls.key, ca.crt   the multi-agent system's (ingest)
#   OUT/prometheus/          tls.crt, tls.key, ca.crt   Prometheus' client certificate (metrics)
#   OUT/control/             tls.crt, tls.key, ca.crt   the control software's (operator, reader)
#   OUT/exo/                 tls.crt, tls.key, ca.crt, mqtt-password   the exoskeleton's publisher
#
# Rotation: run it again. Every leaf certificate is re-issued with a new key (90 days) by the
# kept CA; poirotd re-reads its files, Prometheus too; restart mosquitto (`docker compose restart
# mosquitto`). A password is made only when its file is missing: delete the file to rotate it,
# run this, restart mosquitto; poirotd reads its password file again at its next connect.
# Files are readable by their owner only: give them to the containers' users, e.g.
#   sudo chown -R 10001:10001 OUT/poirotd      (poirotd's image user)
#   sudo chown -R 1883:1883 OUT/mosquitto      (eclipse-mosquitto's user)
#   sudo chown -R 65534:65534 OUT/prometheus   (prom/prometheus runs as nobody)
set -euo pipefail

out=${1:-"$(dirname "$0")/secrets"}
days=${LEAF_DAYS:-90}
umask 077
for folder in ca poirotd/tls mosquitto mas prometheus control exo; do mkdir -p "$out/$folder"; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ ! -f "$out/ca/ca.key" ]]; then
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=poirotd edge CA" -keyout "$out/ca/ca.key" -out "$out/ca/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" 2>/dev/null
fi

# leaf DIR COMMON_NAME EXTENDED_KEY_USAGE SUBJECT_ALT_NAMES
leaf() {
  local dir=$1 name=$2 usage=$3 names=$4
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$work/tls.key" -out "$work/request.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=$usage" "subjectAltName=$names" "subjectKeyIdentifier=hash" \
    "authorityKeyIdentifier=keyid,issuer" >"$work/extensions"
  openssl x509 -req -in "$work/request.csr" -CA "$out/ca/ca.crt" -CAkey "$out/ca/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$work/extensions" \
    -out "$work/tls.crt" 2>/dev/null
  # Moved into place whole: a reader never sees a certificate without its key half-written.
  cp "$out/ca/ca.crt" "$work/ca.crt"
  mv "$work/tls.key" "$dir/tls.key"
  mv "$work/tls.crt" "$dir/tls.crt"
  mv "$work/ca.crt" "$dir/ca.crt"
}

leaf "$out/poirotd/tls" poirotd "serverAuth,clientAuth" \
  "DNS:poirotd,DNS:localhost,IP:127.0.0.1,URI:spiffe://poirotd.local/poirotd"
leaf "$out/mosquitto" mosquitto serverAuth "DNS:mosquitto,DNS:localhost,IP:127.0.0.1"
leaf "$out/mas" mas clientAuth "URI:spiffe://poirotd.local/mas"
leaf "$out/prometheus" prometheus clientAuth "URI:spiffe://poirotd.local/prometheus"
leaf "$out/control" control clientAuth "URI:spiffe://poirotd.local/control"
leaf "$out/exo" exo clientAuth "URI:spiffe://poirotd.local/exo"

for holder in poirotd exo; do
  if [[ ! -f "$out/$holder/mqtt-password" ]]; then
    openssl rand -base64 24 >"$out/$holder/mqtt-password"
  fi
done

passwd_file=$work/passwords
: >"$passwd_file"
add_user() {
  if command -v mosquitto_passwd >/dev/null; then
    mosquitto_passwd -b "$passwd_file" "$1" "$(cat "$2")"
  else
    docker run --rm -v "$work:/work" eclipse-mosquitto:2.0 \
      mosquitto_passwd -b /work/passwords "$1" "$(cat "$2")"
  fi
}
add_user poirotd "$out/poirotd/mqtt-password"
add_user exo "$out/exo/mqtt-password"
mv "$passwd_file" "$out/mosquitto/passwords"

echo "made in $out (CA: $out/ca/ca.crt); hand the files to the containers' users (see above)"
