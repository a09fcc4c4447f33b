#!/usr/bin/env bash
# Install copier on a host (Amazon Linux 2023 or Debian/Ubuntu) as a systemd service.
#
#   scripts/install.sh --bundle DIR [--root DIR] [--no-packages] [--python PYTHON]
#
# --bundle DIR      an unpacked release bundle (make dist; scripts/copier.yaml checks the
#                   archive's SHA-256 before unpacking it). Nothing is downloaded: every
#                   wheel is installed from DIR/wheels with pip --no-index --require-hashes
#                   against DIR/requirements.lock, and every KCL jar is checked against
#                   DIR/kcl-jars.sha256; any difference stops the install.
# --root DIR        install under DIR instead of / (tests, image builds); implies
#                   --no-packages and does not create the service user.
# --no-packages     do not install the Java runtime and Python with dnf/apt-get.
# --python PYTHON   the Python to build the virtualenv with (CPython 3.11: the bundle's wheels).
#
# What it does, each step safe to repeat (running it again installs the bundle's
# versions in place and changes nothing else):
#   1. Java 17+ and Python 3.11 from the distribution's packages (if missing);
#   2. the system user "copier";
#   3. a virtualenv /opt/copier/venv with copier, amazon-kclpy and the KCL jars, verified;
#   4. /etc/copier/copier.properties and /etc/copier/copier.env from the samples,
#      only if they do not exist (an existing config is never overwritten), mode 0640;
#   5. /etc/systemd/system/copier.service and copier-scale-in.service, enabled.
# It does not start the service: write /etc/copier/copier.properties (copier configure,
# or by hand), run `copier check-config /etc/copier/copier.properties`, then
# `systemctl start copier copier-scale-in`.
set -euo pipefail
umask 022

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bundle="" root="" packages=1 python=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) [ $# -ge 2 ] || usage; bundle=$(realpath -m "$2"); shift 2 ;;
        --root) [ $# -ge 2 ] || usage; root=$(realpath -m "$2"); packages=0; shift 2 ;;
        --no-packages) packages=0; shift ;;
        --python) [ $# -ge 2 ] || usage; python="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) say "unknown argument $1"; usage ;;
    esac
done
[ -n "$bundle" ] || usage

unit_dir="$root/etc/systemd/system"
config_dir="$root/etc/copier"
prefix="$root/opt/copier"
venv="$prefix/venv"

for f in "$bundle/requirements.lock" "$bundle/kcl-jars.sha256" "$bundle/wheels"; do
    [ -e "$f" ] || die "$bundle is not a release bundle (no $(basename "$f")): build one with make dist"
done
# The samples travel with this script in the bundle.
for f in "$here/copier.service" "$here/copier-scale-in.service" "$here/../properties/copier.properties" \
         "$here/copier.env"; do
    [ -f "$f" ] || die "missing $f (run install.sh from a copier release bundle)"
done

# 1. Java and Python.
os_id=""
if [ -r /etc/os-release ]; then os_id=$(. /etc/os-release && echo "${ID:-}"); fi
java_ok() { command -v java >/dev/null && java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; }
if [ "$packages" = 1 ]; then
    case "$os_id" in
        amzn)
            java_ok || dnf install -y java-17-amazon-corretto-headless
            command -v python3.11 >/dev/null || dnf install -y python3.11
            ;;
        debian|ubuntu)
            export DEBIAN_FRONTEND=noninteractive
            if ! java_ok || ! python3 -c 'import ensurepip, sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
                apt-get update -q
                apt-get install -y -q openjdk-17-jre-headless python3-venv
            fi
            ;;
        *) die "unsupported distribution '${os_id:-unknown}': install Java 17+ and Python 3.11+, then use --no-packages" ;;
    esac
fi
java_ok || say "warning: Java 17 or later is not on PATH: copier run needs it"
if [ -z "$python" ]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
            python=$(command -v "$candidate"); break
        fi
    done
fi
[ -n "$python" ] || die "no Python 3.11 found (the bundle's wheels are CPython 3.11's; give --python)"

# 2. The service user.
if [ -z "$root" ]; then
    if ! id copier >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir /opt/copier --shell /usr/sbin/nologin copier
        say "created the system user copier"
    fi
else
    say "--root: not creating the user copier (create it in the image)"
fi

# 3. The virtualenv, from the bundle alone: pip installs only the wheels whose SHA-256 the bundle's
#    lock gives (--require-hashes; --no-index: no download), then the installed KCL jars are checked.
mkdir -p "$prefix"
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv with $python"
    "$python" -m venv "$venv"
fi
say "installing the bundle's wheels into $venv (--no-index --require-hashes)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --only-binary=:all: \
        --require-hashes --find-links "$bundle/wheels" -r "$bundle/requirements.lock"; then
    die "pip refused the bundle's wheels (a wheel missing, or its SHA-256 not the lock's): nothing verified was installed"
fi
jars=$("$venv/bin/python" -c 'import amazon_kclpy, os; print(os.path.join(os.path.dirname(amazon_kclpy.__file__), "jars"))')
if ! (cd "$jars" && sha256sum --check --strict --quiet "$bundle/kcl-jars.sha256" >&2); then
    die "the KCL jars in $jars differ from $bundle/kcl-jars.sha256"
fi
expected=$(grep -c '\.jar$' "$bundle/kcl-jars.sha256")
found=$(find "$jars" -maxdepth 1 -name '*.jar' | wc -l)
[ "$expected" = "$found" ] || die "$jars holds $found jars, $bundle/kcl-jars.sha256 lists $expected"
say "KCL jars: $found, each with the SHA-256 of kcl-jars.sha256"

# 4. Config: never overwrite.
mkdir -p "$config_dir"
for pair in "$here/../properties/copier.properties:copier.properties" "$here/copier.env:copier.env"; do
    src=${pair%%:*} name=${pair##*:}
    if [ -e "$config_dir/$name" ]; then
        say "keeping the existing $config_dir/$name"
    else
        install -m 0640 "$src" "$config_dir/$name"
        say "wrote $config_dir/$name (edit it before starting the service)"
    fi
    chmod 0640 "$config_dir/$name"
done
chmod 0750 "$config_dir"
[ -n "$root" ] || chown -R root:copier "$config_dir"

# 5. Units, enabled (systemctl --root works without a running systemd).
mkdir -p "$unit_dir"
install -m 0644 "$here/copier.service" "$here/copier-scale-in.service" "$unit_dir/"
if command -v systemctl >/dev/null; then
    if [ -n "$root" ]; then
        systemctl --root="$root" --quiet enable copier.service copier-scale-in.service
    else
        systemctl daemon-reload
        systemctl --quiet enable copier.service copier-scale-in.service
    fi
else
    mkdir -p "$unit_dir/multi-user.target.wants"
    ln -sfn /etc/systemd/system/copier.service "$unit_dir/multi-user.target.wants/copier.service"
    ln -sfn /etc/systemd/system/copier-scale-in.service "$unit_dir/multi-user.target.wants/copier-scale-in.service"
fi
version=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("copier"))')
say "copier $version installed in $venv from the verified bundle; units enabled. Next: write" \
    "$config_dir/copier.properties (copier configure), copier check-config, systemctl start copier copier-scale-in"
