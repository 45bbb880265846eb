"""The response body's tail: streaming compressors, the flush policy, trained zstd dictionaries
and the sample streams they are trained on.
"""
