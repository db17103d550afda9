"""Errors meant for the user: the CLI prints them as one clear line and exits with status 2."""


class UserFacingError(Exception):
    """Bad input a user can fix: names the file, line or config key at fault."""


class DataError(UserFacingError):
    """A corrupt, missing, misaligned or unverifiable data file."""


class DamagedFileError(DataError):
    """A downloaded file whose content is wrong (truncated, corrupt, not text, misaligned, empty,
    missing): a fresh download fixes it, and the stage's error says how to get one."""


class ConfigError(UserFacingError):
    """An invalid config value or unknown config key."""


class CheckpointError(UserFacingError):
    """A checkpoint that cannot be read or does not match what is expected."""
