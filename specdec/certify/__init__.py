"""`specdec certify`: evidence that a speculative configuration decodes exactly as its target."""

from specdec.certify.local import CertifyReport, CertifySettings, certify_local
from specdec.certify.statistics import ChiSquareResult, goodness_of_fit, homogeneity

__all__ = ["CertifyReport", "CertifySettings", "ChiSquareResult", "certify_local", "goodness_of_fit", "homogeneity"]
