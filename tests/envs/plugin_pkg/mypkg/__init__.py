"""An arlctl plugin used by the tests: the `reverse` environment and its reward."""
