#!/usr/bin/env bash
# Makes a throw-away CA and a server certificate for localhost / 127.0.0.1 in
# DIR (ca.pem, server.pem, server.key), and a bearer token (token, 32 hex
# characters), for the TLS and token tests. Needs the openssl command.
#   bash tests/server/make_test_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 2 -subj "/CN=moeplan test CA" 2>/dev/null
openssl req "${ec[@]}" -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext.cnf
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
  -days 2 -extfile ext.cnf 2>/dev/null
openssl rand -hex 16 >token
