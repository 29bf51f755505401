# The fields of scheduler.ScheduledChunk (a NamedTuple) by name, for the compiled readers of
# a step's chunks (_step.pyx, _batch.pyx): they read a field as the tuple's item (a pointer
# load; an attribute would be a descriptor call per field per sequence per step), never by a
# bare number. scheduler.py checks CHUNK_FIELDS against ScheduledChunk._fields at import.
cdef enum:
    CHUNK_REQUEST = 0        # the Request
    CHUNK_START = 1          # num_computed_tokens before the step
    CHUNK_NUM_NEW = 2        # tokens computed this step
    CHUNK_NEW_BLOCKS = 3     # block ids: all of them when is_new, else those appended this step
    CHUNK_SAMPLE = 4         # samples the next token after this chunk
    CHUNK_IS_NEW = 5         # enters the runner's batch
    CHUNK_SPEC = 6           # drafts: the chunk's last len() tokens

CHUNK_FIELDS = ("request", "start", "num_new_tokens", "new_block_ids", "sample", "is_new", "spec_token_ids")
