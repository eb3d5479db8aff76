"""Numbered SQL migrations (yoyo format), applied by `satchel migrate` and at server start.

Add a file `NNNN_name.sql` starting with `-- depends: <previous id>`; never edit an applied one.
"""
