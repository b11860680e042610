"""The rules of each config group, beside its schema (config/schema/<group>.py): what a value
must be, alone or with others, each error naming the key, the value and what is valid.
config/validate.py applies them to a run at its layout."""
