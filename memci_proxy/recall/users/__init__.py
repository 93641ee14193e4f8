"""Memory across one end user's conversations: ranking, labels and rendering (across, pure), and the search of the
store (search)."""
