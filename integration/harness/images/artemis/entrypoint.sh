#!/bin/sh
# A broker instance made at the first start (login $ARTEMIS_USER / $ARTEMIS_PASSWORD, the
# options in $ARTEMIS_CREATE_OPTIONS), its acceptors the harness's (/work/acceptors.xml,
# mounted), kept across a stop or a kill of the container.
set -e
instance=/var/lib/epochal-artemis/instance
if [ ! -d "$instance/etc" ]; then
    # shellcheck disable=SC2086 # the options are words
    /opt/artemis/bin/artemis create "$instance" --user "$ARTEMIS_USER" \
        --password "$ARTEMIS_PASSWORD" $ARTEMIS_CREATE_OPTIONS >/dev/null
    perl -0pi -e 'BEGIN { local $/; open(F, "/work/acceptors.xml") or die; $a = <F>; }
        s{<acceptors>.*?</acceptors>}{$a}s or die "no <acceptors> in broker.xml"' \
        "$instance/etc/broker.xml"
fi
exec "$instance/bin/artemis" run
