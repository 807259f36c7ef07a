"""The write side: documents → chunks with exact offsets (:mod:`.chunking`, pages too) →
the write protocol over every store (:mod:`.writer`, with :mod:`.progress`) → the JSON
records, chunk keys and bodies (:mod:`.records`) in the record store (:mod:`.store`)."""
