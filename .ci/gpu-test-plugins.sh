# Source from the project's root on a machine set up by .gpukit/env.sh, before the suite: the plugin packages the
# suite expects installed from this checkout, as .ci/run installs them (editable): each one's metadata (its entry
# points) in a folder of their own, its code imported from the checkout. Without them their tests fail by design.
plugin_site=/tmp/gpukit-test-plugins
rm -rf "$plugin_site"
for package in examples/mtbench-example examples/mtbench-classification tests/plugins/frozen/mtbench-frozen-v0; do
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$plugin_site" "$package" \
    || return 1
  rm -rf "$plugin_site/$(basename "$package" | tr - _)" "$package"/*.egg-info "$package/build"  # the checkout's code
  export PYTHONPATH="$PWD/$package${PYTHONPATH:+:$PYTHONPATH}"
done
export PYTHONPATH="$PYTHONPATH:$plugin_site"
