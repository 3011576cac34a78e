"""All writes. One module per sub-domain; views, tasks and admin call these."""
