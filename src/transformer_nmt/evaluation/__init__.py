"""Evaluation: sacreBLEU scoring of translations (``score``) and the results report (``report``)."""
