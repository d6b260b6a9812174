# shellcheck shell=bash
# Sourced by tools/install_deps.sh and tools/check_aarch64.sh (as root): installs those of
# the Debian packages named that are not installed yet, saying which, or that all are.
#   install_missing_debian_packages LABEL PACKAGE...
install_missing_debian_packages() {
  local label=$1 package
  shift
  local missing=()
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$label: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "$label: all $# packages present"
  fi
}
