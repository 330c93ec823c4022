#!/bin/bash
wc -l < input.txt | tr -d ' ' > count.txt
tr '[:lower:]' '[:upper:]' < input.txt > upper.txt
