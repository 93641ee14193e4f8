"""The days a recall query asks about (pure: today is passed in): calendar dates and their combination (asked),
times counted back from today (relative)."""
