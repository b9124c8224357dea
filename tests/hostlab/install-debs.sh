#!/usr/bin/env bash
# Install the Debian packages the hostlab test hosts need (idempotent; run as root).
#   openssh-server        /usr/sbin/sshd for sshd-only hosts (and ssh-keygen)
#   openssh-client        ssh, for readiness checks and the hostlab tests
#   debootstrap           builds the cached bookworm rootfs for containers
#   debian-archive-keyring  lets debootstrap verify the Release file it fetches
#   systemd-container     systemd-nspawn, to boot the containers
#   iproute2              ip netns / ip link / ip addr
set -euo pipefail

packages=(openssh-server openssh-client debootstrap debian-archive-keyring systemd-container iproute2)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "hostlab debs: all present"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# policy-rc.d keeps the package scripts from starting a system sshd on port 22 here.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "hostlab debs: installed ${missing[*]}"
