"""Built-in presets shipped with solrl: TOML files under models/, families/ and rewards/.

Installed as the package `solrl_presets`; `solrl_core.config.presets` finds them by file name.
"""
