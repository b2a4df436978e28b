#!/usr/bin/env bash
# Checks the packages packaging/build.sh made, on this machine (CI runs it as root):
# lintian, install, files, user and conffile, versions from the installed paths,
# `systemd-analyze verify` of the installed units, an upgrade over the same version that
# keeps a local conffile edit, purge; then the .rpm file lists and scriptlets.
#
#   bash packaging/check.sh PKG_DIR
#
# Installs and removes the mopd and mop-server .debs: run it on a throwaway machine.
set -euo pipefail
dir="$(cd "${1:?usage: packaging/check.sh PKG_DIR}" && pwd)"
cd "$(dirname "$0")/.."
deb_mopd=$(ls "$dir"/mopd_*.deb)
deb_server=$(ls "$dir"/mop-server_*.deb)
rpm_mopd=$(ls "$dir"/mopd-*.rpm)
rpm_server=$(ls "$dir"/mop-server-*.rpm)
deb_curate=$(ls "$dir"/mop-curate_*.deb)
rpm_curate=$(ls "$dir"/mop-curate-*.rpm)

fail() { echo "packaging check FAILED: $*" >&2; exit 1; }
step() { printf '\n-- %s --\n' "$*"; }
has_line() { grep -qxF -- "$2" <<<"$1" || fail "$3: expected line '$2' in:"$'\n'"$1"; }

step "lintian (errors fail the check)"
lintian --fail-on error "$deb_mopd" "$deb_server" "$deb_curate"

step "mop-curate installs alone (no daemon, no server) and removes cleanly"
dpkg -i "$deb_curate"
/usr/bin/mop-curate --version
/usr/bin/mop-curate --help | grep -q review || fail "mop-curate --help does not name review"
for f in /usr/bin/mopd /usr/bin/mop-server; do
  [ ! -e "$f" ] || fail "$f came with mop-curate"
done
dpkg -P mop-curate
[ ! -e /usr/bin/mop-curate ] || fail "/usr/bin/mop-curate is still there after dpkg -P"

step "dpkg -i"
dpkg -i --force-confold "$deb_mopd" "$deb_server"

step "users, files, conffiles"
getent passwd mop >/dev/null || fail "user mop was not created"
getent group mop >/dev/null || fail "group mop was not created"
getent passwd mop-server >/dev/null || fail "user mop-server was not created"
for f in /usr/bin/mopd /usr/bin/mop /usr/bin/mop-server \
         /usr/lib/systemd/system/mopd.service /usr/lib/systemd/system/mop-server.service \
         /usr/lib/sysusers.d/mop.conf /usr/lib/sysusers.d/mop-server.conf \
         /usr/lib/tmpfiles.d/mopd.conf \
         /usr/share/mopd/profiles/default.toml /usr/share/mopd/profiles/offline.toml \
         /usr/share/mopd/embedding/install-model.sh /usr/share/mopd/embedding/distill_use.py \
         /usr/share/mopd/embedding/requirements.txt \
         /etc/mopd/mopd.toml /etc/mop-server/server.toml; do
  [ -e "$f" ] || fail "$f is missing after dpkg -i"
done
dpkg-query -W -f='${Conffiles}\n' mopd | grep -q ' /etc/mopd/mopd.toml ' \
  || fail "/etc/mopd/mopd.toml is not a conffile of mopd"
dpkg-query -W -f='${Conffiles}\n' mop-server | grep -q ' /etc/mop-server/server.toml ' \
  || fail "/etc/mop-server/server.toml is not a conffile of mop-server"
[ "$(stat -c %G:%a /etc/mopd)" = "mop:750" ] || fail "/etc/mopd is $(stat -c %G:%a /etc/mopd), want mop:750"
[ "$(stat -c %U:%G:%a /var/cache/mopd)" = "mop:mop:750" ] \
  || fail "/var/cache/mopd is $(stat -c %U:%G:%a /var/cache/mopd), want mop:mop:750"
[ "$(stat -c %U:%a /var/lib/mop-server)" = "mop-server:750" ] \
  || fail "/var/lib/mop-server is $(stat -c %U:%a /var/lib/mop-server), want mop-server:750"

step "versions from the installed paths"
/usr/bin/mopd --version
/usr/bin/mop --version
/usr/bin/mop-server --version

step "systemd-analyze verify (installed units)"
systemd-analyze verify /usr/lib/systemd/system/mopd.service /usr/lib/systemd/system/mop-server.service

step "upgrade over the same version keeps a local conffile edit"
echo "# local edit $$" >>/etc/mopd/mopd.toml
echo "# local edit $$" >>/etc/mop-server/server.toml
dpkg -i --force-confold "$deb_mopd" "$deb_server"
grep -qxF "# local edit $$" /etc/mopd/mopd.toml || fail "the edit of /etc/mopd/mopd.toml was lost"
grep -qxF "# local edit $$" /etc/mop-server/server.toml || fail "the edit of /etc/mop-server/server.toml was lost"
/usr/bin/mopd --version >/dev/null

step "purge"
dpkg -P mopd mop-server
for f in /usr/bin/mopd /usr/bin/mop /usr/bin/mop-server /etc/mopd/mopd.toml \
         /etc/mop-server/server.toml /var/cache/mopd /var/lib/mopd /var/lib/mop-server; do
  [ ! -e "$f" ] || fail "$f is still there after dpkg -P"
done

step "rpm file lists"
files=$(rpm -qlp "$rpm_mopd")
for f in /usr/bin/mopd /usr/bin/mop /etc/mopd/mopd.toml /usr/lib/systemd/system/mopd.service \
         /usr/lib/sysusers.d/mop.conf /usr/lib/tmpfiles.d/mopd.conf \
         /usr/share/mopd/profiles/default.toml /usr/share/mopd/profiles/offline.toml \
         /usr/share/mopd/embedding/install-model.sh; do
  has_line "$files" "$f" "$rpm_mopd"
done
files=$(rpm -qlp "$rpm_server")
for f in /usr/bin/mop-server /etc/mop-server/server.toml \
         /usr/lib/systemd/system/mop-server.service /usr/lib/sysusers.d/mop-server.conf; do
  has_line "$files" "$f" "$rpm_server"
done
has_line "$(rpm -qlp "$rpm_curate")" /usr/bin/mop-curate "$rpm_curate"
has_line "$(rpm -qp --configfiles "$rpm_mopd")" /etc/mopd/mopd.toml "$rpm_mopd config files"
has_line "$(rpm -qp --configfiles "$rpm_server")" /etc/mop-server/server.toml "$rpm_server config files"
rpm -qp --requires "$rpm_mopd" | grep -qx bubblewrap || fail "$rpm_mopd does not require bubblewrap"

step "rpm scriptlets"
for pair in "$rpm_mopd:mopd:mop" "$rpm_server:mop-server:mop-server"; do
  IFS=: read -r rpm unit user <<<"$pair"
  scripts=$(rpm -qp --scripts "$rpm")
  for want in "preinstall scriptlet" "postinstall scriptlet" "preuninstall scriptlet" \
              "postuninstall scriptlet" "useradd -r -g $user" \
              "systemctl --no-reload preset $unit.service" \
              "systemctl --no-reload disable --now $unit.service" \
              "systemctl try-restart $unit.service"; do
    grep -qF -- "$want" <<<"$scripts" || fail "$rpm: scriptlets lack '$want'"
  done
  for s in packaging/rpm/"$unit"/*.sh; do sh -n "$s" || fail "$s: shell syntax"; done
done

echo
echo "packaging check passed: $(basename "$deb_mopd") $(basename "$deb_server") $(basename "$deb_curate") $(basename "$rpm_mopd") $(basename "$rpm_server") $(basename "$rpm_curate")"
