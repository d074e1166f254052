#!/bin/sh
# The host discovery script of tests/test_elastic.py: the hosts the test
# (or the training script) last wrote to $TFRING_TEST_HOSTS_FILE.
cat "$TFRING_TEST_HOSTS_FILE"
