#!/bin/sh
# Started in place of a new rank by tf_loop.py's spawn_fails scenario: a
# program that never joins the job (as a rank whose start hangs inside
# PRRTE). It ends by itself after a while, so the job can end.
sleep 20
