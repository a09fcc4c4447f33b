#!/usr/bin/env bash
# Install copier on a host (Amazon Linux 2023 or Debian/Ubuntu) as a systemd service.
#
#   scripts/install.sh WHEEL_OR_VERSION [--root DIR] [--no-packages] [--python PYTHON]
#
# WHEEL_OR_VERSION  a copier wheel (make dist builds one in dist/), or a version
#                   to install from the index pip is configured for (PIP_INDEX_URL:
#                   your private index; "copier" on public PyPI is another project,
#                   so a version needs PIP_INDEX_URL or PIP_FIND_LINKS).
# --root DIR        install under DIR instead of / (tests, image builds); implies
#                   --no-packages and does not create the service user.
# --no-packages     do not install the Java runtime and Python with dnf/apt-get.
#
# What it does, each step safe to repeat (running it again upgrades copier in
# place and changes nothing else):
#   1. Java 17+ and Python 3.11+ from the distribution's packages (if missing);
#   2. the system user "copier";
#   3. a virtualenv /opt/copier/venv with copier, amazon-kclpy and the KCL jars
#      (the jars are checked: copier run needs them);
#   4. /etc/copier/copier.properties and /etc/copier/copier.env from the samples,
#      only if they do not exist (an existing config is never overwritten);
#   5. /etc/systemd/system/copier.service and copier-scale-in.service, enabled.
# It does not start the service: edit /etc/copier/copier.properties, run
# `copier check-config /etc/copier/copier.properties`, then
# `systemctl start copier copier-scale-in`.
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
spec="" root="" packages=1 python=""
while [ $# -gt 0 ]; do
    case "$1" in
        --root) [ $# -ge 2 ] || usage; root=$(realpath -m "$2"); packages=0; shift 2 ;;
        --no-packages) packages=0; shift ;;
        --python) [ $# -ge 2 ] || usage; python="$2"; shift 2 ;;
        -h|--help) usage ;;
        -*) say "unknown option $1"; usage ;;
        *) [ -z "$spec" ] || usage; spec="$1"; shift ;;
    esac
done
[ -n "$spec" ] || usage

unit_dir="$root/etc/systemd/system"
config_dir="$root/etc/copier"
prefix="$root/opt/copier"
venv="$prefix/venv"

# The samples travel with this script: a source tree or the bundle of make dist.
for f in "$here/copier.service" "$here/copier-scale-in.service" "$here/../properties/copier.properties" \
         "$here/copier.env"; do
    [ -f "$f" ] || die "missing $f (run install.sh from a copier source tree or release bundle)"
done

if [ -f "$spec" ]; then
    case "$spec" in *.whl) ;; *) die "$spec is not a wheel (.whl)" ;; esac
    package=$(realpath "$spec")
elif [[ "$spec" =~ ^[0-9][0-9A-Za-z.+-]*$ ]]; then
    if [ -z "${PIP_INDEX_URL:-}${PIP_FIND_LINKS:-}" ]; then
        die "version $spec: set PIP_INDEX_URL (or PIP_FIND_LINKS) to the index holding copier; \
\"copier\" on public PyPI is an unrelated project"
    fi
    package="copier==$spec"
else
    die "$spec is neither a wheel file nor a version"
fi

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
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
            python=$(command -v "$candidate"); break
        fi
    done
fi
[ -n "$python" ] || die "no Python 3.11 or later found (give --python)"

# 2. The service user.
if [ -z "$root" ]; then
    if ! id copier >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir /opt/copier --shell /usr/sbin/nologin copier
        say "created the system user copier"
    fi
else
    say "--root: not creating the user copier (create it in the image)"
fi

# 3. The virtualenv. The KCL jars are downloaded from Maven Central while
#    amazon-kclpy builds (KCL_MVN_REPO_SEARCH_URL points it at a mirror).
mkdir -p "$prefix"
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv with $python"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
fi
say "installing $package into $venv"
"$venv/bin/python" -m pip install --quiet --upgrade "$package"
"$venv/bin/python" -m copier.kcl.jars --check >&2

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
done
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
say "copier $version installed in $venv; units enabled. Next: edit $config_dir/copier.properties, then" \
    "copier check-config and systemctl start copier copier-scale-in"
