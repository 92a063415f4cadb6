# `make test` is the test command: hack/test.sh checks and installs what the tests need, builds
# what they run, then runs `cargo test --workspace`. See README.md, "Tests".

.PHONY: test test-check test-setup

# Every test, after installing and building what they need.
test:
	hack/test.sh

# Which prerequisite is there and which is missing (installs nothing).
test-check:
	hack/test.sh check

# Install and build what the tests need, without running them.
test-setup:
	hack/test.sh install check build
