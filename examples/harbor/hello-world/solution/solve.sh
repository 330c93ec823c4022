#!/bin/bash
# The oracle: what a correct agent does.
echo "Hello, world!" > hello.txt
