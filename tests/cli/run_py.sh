#!/bin/bash
# Runs a Python test script (the first argument) with the rest as its arguments.
exec python3 "$@"
