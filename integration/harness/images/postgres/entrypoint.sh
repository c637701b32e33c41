#!/bin/sh
# A cluster made at the first start (superuser $POSTGRES_USER, its password from
# $POSTGRES_PASSWORD, scram over TCP), kept across a stop or a kill of the container; the
# arguments are the server's settings (-c name=value ...).
set -e
bin=/usr/lib/postgresql/15/bin
data=/var/lib/epochal-postgres/data
sockets=/var/run/epochal-postgres
mkdir -p "$data" "$sockets"
chown postgres "$data" "$sockets"
if [ ! -s "$data/PG_VERSION" ]; then
    umask 077
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    runuser -u postgres -- "$bin/initdb" -D "$data" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f /tmp/pwfile
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$data/pg_hba.conf"
fi
exec runuser -u postgres -- "$bin/postgres" -D "$data" -c listen_addresses='*' \
    -c unix_socket_directories="$sockets" "$@"
