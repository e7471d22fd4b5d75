"""Streamlit entry point: navigation and the home page. Thin: all logic lives in gae_core."""

import streamlit as st

st.set_page_config(page_title="GAE Lab", page_icon="λ", layout="wide")


def home() -> None:
    st.title("GAE Lab")
    st.markdown(
        "A workbench for advantage estimators in policy-gradient RL: the TD residual "
        "δ_t, the k-step estimators Â^(k) and GAE(γ, λ) "
        "([Schulman et al., 2016](https://arxiv.org/abs/1506.02438)).\n\n"
        "The estimator library `gae_core` is ready; training, the advantage explorer and "
        "λ comparisons arrive as pages in the sidebar."
    )


st.navigation([st.Page(home, title="Home", icon="🏠", default=True)]).run()
