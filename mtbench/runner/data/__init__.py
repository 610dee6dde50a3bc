"""Reading data: takes a configuration (a registered dataset or the user's corpus files) and gives the cleaned,
split corpus, its sentencepiece tokenizer, the encoded splits and the length-bucketed batches a run trains on."""
