<#
.SYNOPSIS
  Build Sangama's Windows installer (MSI) with Briefcase, engine wheel included.

.DESCRIPTION
  1. Builds the engine wheel with installers/engine/build_wheel.py (llama-cpp-python with
     every kept CPU variant loaded at run time, plus the GPU backend chosen with -Gpu),
     unless -EngineWheel names one already built.
  2. Stages the project (installers/windows/stage.py): the sources and a pyproject.toml
     holding briefcase.toml's settings, the engine pin replaced by that wheel.
  3. Runs briefcase create / build / package windows in the staged copy. With -Gpu cuda
     the CUDA runtime DLLs the engine links against are copied into the app first.
     Briefcase's `windows` target puts its CPython 3.11 support package (python311.dll and
     the standard library) into the app: like the Linux package, the MSI runs on a Python
     of its own, never on one installed on the PC (installers/README.md).
  4. Copies the MSI to -Out, named after the GPU flavour.

  Not run on the Linux machine this project is developed on: see installers/README.md,
  "Windows", for what has and has not been verified.

.PARAMETER Gpu
  vulkan (default: NVIDIA, AMD and Intel GPUs with the driver the PC has), cuda (NVIDIA,
  ships cudart and cuBLAS, hundreds of MB more) or cpu (no GPU backend).

.EXAMPLE
  powershell -ExecutionPolicy Bypass -File installers\windows\build.ps1 -Gpu vulkan
#>
[CmdletBinding()]
param(
    [ValidateSet("vulkan", "cuda", "cpu")]
    [string]$Gpu = "vulkan",
    [string]$EngineWheel = "",
    [string]$Out = "dist",
    [int]$Jobs = [Environment]::ProcessorCount
)

$ErrorActionPreference = "Stop"
$Root = (Resolve-Path (Join-Path $PSScriptRoot "..\..")).Path
$Work = Join-Path $Root "build\installer-windows"
$Briefcase = "briefcase==0.4.7"

function Invoke-Step([string]$What, [scriptblock]$Block) {
    Write-Host "== $What"
    & $Block
    if ($LASTEXITCODE -ne 0) { throw "$What failed with exit code $LASTEXITCODE" }
}

function Enter-DevShell {
    # The engine compiles C/C++ (and CUDA): the Visual Studio build tools' environment.
    $vswhere = Join-Path ${env:ProgramFiles(x86)} "Microsoft Visual Studio\Installer\vswhere.exe"
    if (-not (Test-Path $vswhere)) { throw "Visual Studio Build Tools (C++ workload) are required" }
    $vs = & $vswhere -latest -products * -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -property installationPath
    if (-not $vs) { throw "Visual Studio has no C++ x64 tools installed" }
    Import-Module (Join-Path $vs "Common7\Tools\Microsoft.VisualStudio.DevShell.dll")
    Enter-VsDevShell -VsInstallPath $vs -SkipAutomaticLocation -DevCmdArguments "-arch=x64 -host_arch=x64" | Out-Null
}

# --- Python 3.11 and the build tools, in a venv of their own ---------------------------
$Venv = Join-Path $Work "venv"
if (-not (Test-Path (Join-Path $Venv "Scripts\python.exe"))) {
    Invoke-Step "create the build venv (Python 3.11)" { py -3.11 -m venv $Venv }
}
$Py = Join-Path $Venv "Scripts\python.exe"
Invoke-Step "install the build tools" {
    & $Py -m pip install --quiet --upgrade pip $Briefcase cmake ninja scikit-build-core
}

# --- 1. the engine wheel ----------------------------------------------------------------
if (-not $EngineWheel) {
    Enter-DevShell
    $env:CMAKE_GENERATOR = "Ninja"
    if ($Gpu -eq "cuda") {
        # nvcc wants MSVC as its host compiler. MSVC cannot build the zen4 CPU variant
        # (ggml skips it there), so AVX-512 BF16 CPUs run the icelake kernels in this flavour.
        if (-not $env:CUDA_PATH) { throw "CUDA_PATH is not set: install the CUDA toolkit" }
        $env:CC = "cl"; $env:CXX = "cl"
    } else {
        # clang-cl builds every kept variant, zen4 included, as llama.cpp's own Windows
        # releases do (Visual Studio's "C++ Clang tools for Windows" component).
        $env:CC = "clang-cl"; $env:CXX = "clang-cl"
        if ($Gpu -eq "vulkan" -and -not $env:VULKAN_SDK) {
            throw "VULKAN_SDK is not set: install the Vulkan SDK (headers, glslc)"
        }
    }
    $gpuArgs = @()
    if ($Gpu -ne "cpu") { $gpuArgs = @("--gpu", $Gpu) }
    $lines = & $Py (Join-Path $Root "installers\engine\build_wheel.py") @gpuArgs --jobs $Jobs
    if ($LASTEXITCODE -ne 0) { throw "the engine wheel build failed" }
    $EngineWheel = ($lines | Select-Object -Last 1).Trim()
}
if (-not (Test-Path $EngineWheel)) { throw "no engine wheel at $EngineWheel" }
Write-Host "engine wheel: $EngineWheel"

# --- 2. the staged project --------------------------------------------------------------
$Project = Join-Path $Work "project"
Invoke-Step "stage the project" {
    & $Py (Join-Path $Root "installers\windows\stage.py") --engine-wheel $EngineWheel --out $Project
}

# --- 3. briefcase -------------------------------------------------------------------------
Push-Location $Project
try {
    Invoke-Step "briefcase create windows" { & $Py -m briefcase create windows --no-input }
    Invoke-Step "briefcase build windows" { & $Py -m briefcase build windows --no-input }
    if ($Gpu -eq "cuda") {
        # The CUDA engine links cudart and cuBLAS; a volunteer's PC has the driver only.
        $lib = Get-ChildItem -Recurse -Directory -Path "build\sangama\windows" |
            Where-Object { $_.FullName -like "*app_packages\llama_cpp\lib" } | Select-Object -First 1
        if (-not $lib) { throw "llama_cpp\lib not found in the built app" }
        foreach ($dll in @("cudart64_*.dll", "cublas64_*.dll", "cublasLt64_*.dll")) {
            Copy-Item (Join-Path $env:CUDA_PATH "bin\$dll") $lib.FullName
        }
    }
    # No signing identity here: the MSI is unsigned (SmartScreen warns on first run).
    Invoke-Step "briefcase package windows" { & $Py -m briefcase package windows --no-input }
    $msi = Get-ChildItem "dist\*.msi" | Select-Object -First 1
    if (-not $msi) { throw "briefcase wrote no MSI" }
} finally {
    Pop-Location
}

# --- 4. the result -------------------------------------------------------------------------
New-Item -ItemType Directory -Force -Path $Out | Out-Null
$target = Join-Path $Out ($msi.BaseName + "-$Gpu.msi")
Copy-Item $msi.FullName $target -Force
Write-Host ("{0} ({1:N0} MB)" -f $target, ((Get-Item $target).Length / 1MB))
Write-Output $target
